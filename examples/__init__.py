"""Small, runnable examples the docs pull their code from (``examples/tour``: the concept tour)."""
