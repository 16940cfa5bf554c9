"""The language server (`qrun lsp`, docs/editor.md): qrun/lsp/server.py wires the protocol
(pygls, the `lsp` extra) to pure analysis functions, one module each, that take a document's
text and path and return plain data: diagnostics, hover, completion, definition, symbols."""
