import _signal

# The command (`python -m mpilaunch`, the console script, the shims): a Ctrl-C while the first
# modules are imported ends it quietly, by the signal; entry.main then makes Ctrl-C leave at
# once with status 130, until the run's own handling takes over. One that came while Python
# started is met here, where the handler is changed: it ends the launcher the same way. An
# ignored SIGINT (a job started with `&` by a script) stays ignored.
try:
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
        _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
except KeyboardInterrupt:
    _signal.signal(_signal.SIGINT, _signal.SIG_DFL)
    _signal.raise_signal(_signal.SIGINT)

from mpilaunch.entry import main

if __name__ == "__main__":
    main()
