"""Stand-in for xgrammar (45 MB wheel), installed by ``repro install-offline``.

sglang 0.5.17 imports ``xgrammar.StructuralTag`` and the format classes of ``xgrammar.structural_tag``
at module level (tool-call detectors; the OpenAI protocol uses ``StructuralTag`` inside a pydantic
``Union``), but builds grammars only with a grammar backend. Serve with ``--grammar-backend none``.
Everything else (``get_model_structural_tag``, ``GrammarCompiler``, ...) is deliberately absent, so
sglang's own ``except ImportError`` fallbacks apply.
"""

from pydantic import BaseModel, ConfigDict

__repro_stub__ = True
__version__ = "0+repro.stub"


class StructuralTag(BaseModel):
    """Accepts any fields; no grammar is ever built from it."""

    model_config = ConfigDict(extra="allow")
