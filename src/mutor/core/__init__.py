"""The objective engine: what every method's config shares (``config``), where registers go (``layout``), who
attends to whom (``masks``, ``attention``), the losses (``loss``) and which model families it handles exactly
(``support``).

Imports only :mod:`mutor.utils`; knows nothing of Trainer, recipes, tasks or the methods that configure it.
"""
