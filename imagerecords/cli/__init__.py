"""The `imagerecords` command: flags, pre-flight checks, the launcher, verify, inspect and report."""
