"""torchrun's node meeting: one launcher per node meets the others through a TCPStore, and
watches that store while the job runs."""
