"""The NRI plugin: the protocol (protocol.py, messages.py) apart from the policy (policy.py,
nativehook.py); plugin.py runs them on containerd's socket, hook.py is the hook it hands out."""
