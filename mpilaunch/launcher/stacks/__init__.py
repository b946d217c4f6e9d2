"""Looks at running ranks: stack snapshots (asked for by SIGQUIT, `mpilaunch stacks`, the
timeouts), their text and grouping, the job's socket that `mpilaunch stacks` and
`mpilaunch top` ask through, and each rank's live use for `mpilaunch top`."""
