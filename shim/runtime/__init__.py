"""The runtime's create path: runc's command line (`runc_args`), the requests a container
makes (`requests`), the run log in runc's format (`runlog`), the work before runc (`main`)
and the resident process that does it in warm workers (`resident`).

Nothing is imported here: the create path pays only for the modules it uses.
"""
