"""The run pipeline behind the ``mutor`` command: recipes (``recipe``), building what a recipe names
(``build``), training (``train``), precision (``precision``) and the thin command-line entry points
(``cli``, ``*_cli``).

The top layer: may import anything below; nothing imports it.
"""
