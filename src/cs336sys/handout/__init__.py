"""Floor 6, handout: the answers to the handout's questions — one run's ``answers.md``
(``answers``, one module per part of the handout) and one page over several runs (``page``:
``python -m cs336sys.handout``). Above the studies and the pipeline; a study's figures and findings
are reached through the registry (``studies.report_module``), never by a study's module path.
Never imports torch.
"""
