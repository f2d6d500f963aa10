"""Framework-neutral code of cvae-rosetta, written once for every implementation."""
