"""The benchmark harness behind ``cvae bench``: it measures, writes a result file, renders it."""
