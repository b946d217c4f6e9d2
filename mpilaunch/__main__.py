import _signal

# `python -m mpilaunch` is the command: a Ctrl-C while its first module is imported ends it
# quietly, by the signal; entry.main then makes Ctrl-C leave at once with status 130, until
# the run's own handling takes over.
_signal.signal(_signal.SIGINT, _signal.SIG_DFL)

from mpilaunch.entry import main  # noqa: E402

if __name__ == "__main__":
    main()
