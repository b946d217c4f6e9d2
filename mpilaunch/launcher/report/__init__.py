"""What the user reads of a run: the console's lines and failure summary, the --report-json
document, and the root cause read from a failed rank's stderr."""
