"""The job-wide half of MPI wire-up: PMI fences and PMIx collectives across hosts, PMIx's
cross-job joins, and MPI_Comm_spawn's new jobs."""
