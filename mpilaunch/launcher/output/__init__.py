"""Rank output: byte-exact log files (the log tree, hydra's pattern files, one open file per
destination), whole lines on the console written from threads of their own, and the lock
that keeps two jobs off one tree."""
