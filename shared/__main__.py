"""``python -m cvae_rosetta`` runs the ``cvae`` command."""

from cvae_rosetta.cli import main

raise SystemExit(main())
