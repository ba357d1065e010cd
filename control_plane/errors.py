"""The control plane's start-up error, apart from server.py so that the CLI maps it without
loading the server (grpc servicers, the store, the planner's search)."""


class StartError(RuntimeError):
    """The server cannot start as asked: the message says why."""
