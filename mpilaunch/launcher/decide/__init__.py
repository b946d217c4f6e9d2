"""The run's decisions apart from any descriptor: the policy (events in, a clock, decisions
out), the states of the run and of each rank, what each signal to the launcher does, and the
exit status by each launcher's rules. Nothing here reads a descriptor or the real clock."""
