"""Pure analysis: functions over numpy arrays and DataFrames. No I/O; imports neither harness nor devices."""
