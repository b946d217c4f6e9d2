"""What mpilaunch says of itself under another launcher's name (`mpilaunch shims`): the first
line of `--version` that tools read to tell which MPI they were given, and `ompi_info`.

Tools decide on words: Horovod looks for "Open MPI" (then "MPICH", then "Intel(R) MPI") in
`mpirun --version`; DeepSpeed only needs `ompi_info` on PATH. Each text says what it is: the
launcher whose command line mpilaunch reads under that name, and mpilaunch's own version. No
text claims an MPI library: the ranks' library is their own.
"""

from __future__ import annotations

import sys

from mpilaunch import __version__
from mpilaunch.cli.dialect import BY_NAME, HYDRA

OPEN_MPI_LINE = "4.1"  # the mpirun whose command line (options, placement, variables) mpilaunch follows


def version_text(name: str) -> str:
    """`NAME --version`: Open MPI's first line for mpirun and its kin, hydra's for mpiexec.hydra,
    mpilaunch's own for torchrun (which has no --version: no tool reads one)."""
    if name in ("mpilaunch", "torchrun"):
        return f"mpilaunch {__version__}"
    if BY_NAME.get(name) == HYDRA:
        return (
            f"HYDRA build details: {name} is mpilaunch {__version__}, reading MPICH hydra's command line\n"
            f"    Version:                                 {OPEN_MPI_LINE}\n"
            "    Process Manager:                         pmi (served by mpilaunch: PMI-1, PMI-2 and PMIx)\n"
            "    Launchers available:                     ssh rsh fork slurm\n"
            "    MPI library:                             none (the ranks bring their own)"
        )
    both = " and MPICH hydra's mpiexec" if name == "mpiexec" else ""
    return (
        f"{name} (Open MPI) {OPEN_MPI_LINE}: mpilaunch {__version__}, reading Open MPI {OPEN_MPI_LINE}'s mpirun"
        f"{both} command line\n\n"
        "No MPI library comes with it: Open MPI, MPICH and Intel MPI ranks are each served what their own\n"
        "launcher serves them."
    )


def ompi_info(args: list[str]) -> int:
    """`ompi_info`: Open MPI's own when one is on PATH after the shim (it tells the truth about
    the library the ranks load: `mpi_built_with_cuda_support`, ...); else what tools and people
    read from it, as mpilaunch can say it truly."""
    from mpilaunch.cli.shims import exec_real

    exec_real("ompi_info", args)  # else mpilaunch's own answer
    if any(word in ("--version", "-V", "-version") for word in args):
        print(f"Open MPI v{OPEN_MPI_LINE} (command line): mpilaunch {__version__}, not an MPI library")
        return 0
    if any(word in ("--parsable", "--parseable") for word in args):
        rows = [
            f"package:mpilaunch {__version__} (a launcher, not an MPI library)",
            f"ompi:version:full:{OPEN_MPI_LINE}",
            f"path:prefix:{sys.prefix}",
            "mca:plm:mpilaunch:version:ssh,slurm,local",
        ]
        print("\n".join(rows))
        return 0
    rows = [
        ("Package", f"mpilaunch {__version__} (a launcher, not an MPI library)"),
        ("Open MPI", f"{OPEN_MPI_LINE} (the mpirun command line mpilaunch reads)"),
        ("Open MPI repo revision", "none: this is mpilaunch's ompi_info"),
        ("Prefix", sys.prefix),
        ("Configured by", "mpilaunch shims"),
        ("MPI library", "none: the ranks bring their own (Open MPI ranks are served PMIx)"),
        ("MCA plm", "mpilaunch (ssh, slurm, local)"),
    ]
    width = max(len(key) for key, _ in rows)
    for key, value in rows:
        print(f"{key:>{width + 2}}: {value}")
    if args:
        print(f"{'':>{width + 2}}  (mpilaunch's ompi_info has no more to say about {' '.join(args)})")
    return 0
