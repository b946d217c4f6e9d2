import _signal

# `python -m mpilaunch` is the command: a Ctrl-C before the run's own handling starts ends it
# quietly (entry.main does the same for the installed script, from its first line on).
_signal.signal(_signal.SIGINT, _signal.SIG_DFL)

from mpilaunch.entry import main  # noqa: E402

if __name__ == "__main__":
    main()
