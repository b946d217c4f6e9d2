"""From a JobSpec to running agents: the path plan, probe, finalize, run (`launch.py`), the
greeting of every new agent, this machine's facts, agents started during the run, the rank
table's gathering, and `mpilaunch check`/`allrun`."""
