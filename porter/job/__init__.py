"""Job: running a porting job. This package owns turning user input into a validated job
(`jobs.py`: the spec, the backend, the template snapshot to store), the one job loop that both
`porter port` and the service's workers run (`loop.py`: propose, static check, compile, measure,
verify, record, tell; budget, deadline and final status defined once, with hooks for what
differs), and the embedded run with its progress bar and warm starts (`run.py`)."""
