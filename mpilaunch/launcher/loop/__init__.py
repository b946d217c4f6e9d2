"""The controller's one event loop: the agents' links and their frames, the launcher's signals
as bytes on a pipe, stdin, and the run's event stream that carries every decision to its
subscribers."""
