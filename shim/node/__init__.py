"""Node set-up: containerd's configuration (`containerd_config`) and the RuntimeClass
(`runtimeclass`)."""
