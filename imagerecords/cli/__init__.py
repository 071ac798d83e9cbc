"""The `imagerecords` command: argv to build options, exit codes, progress and summary, verify, inspect, report."""
