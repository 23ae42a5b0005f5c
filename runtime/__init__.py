"""Runtime: loads and runs what fgc emitted; never imports `compiler`."""
