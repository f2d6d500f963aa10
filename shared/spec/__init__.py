"""The contract an implementation needs: what the spec computes, and the protocol it is reached by.

Nothing here imports anything of the project outside ``cvae_rosetta.spec``.
"""
