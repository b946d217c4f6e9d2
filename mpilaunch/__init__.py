"""mpilaunch: an mpirun-style launcher and MPI process manager."""

__version__ = "0.1.0"
