"""The concept tour: one file per concept, each framework's version in its own marked section.

Every file runs as a script (``python -m examples.tour.stateful_layers``) and is checked by
``tests/test_tour.py``; the pages under ``docs/tour/`` pull their code from the marked sections.
"""
