"""`tfdist-run`, the local multi-process launcher (see `tfdist.launch.cli`)."""
