"""The training methods, each a wrapper around an unmodified causal LM and each in a folder of its own, as
peft's ``tuners/<method>/`` (config + model, registering itself): MuToR (``mutor``), the next-token baseline
(``next_token``) and the Multi-Token baseline (``multi_token``). They share one base (``base``: the wrapper;
``objective``: the loss arithmetic; ``checkpoint``: base model + sidecar) and one registry (``registry``) that
everything above consults by method name.

Importing this package registers the three methods, in this order. Imports :mod:`mutor.core`,
:mod:`mutor.models` and :mod:`mutor.utils` only.
"""

# the order of these imports is the order that method_names() lists the methods in
# isort: off
from . import next_token  # noqa: F401
from . import mutor  # noqa: F401
from . import multi_token  # noqa: F401
# isort: on
