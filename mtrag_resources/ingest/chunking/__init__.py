"""Files -> parent/child chunks: code (Python's ast, tree-sitter for other languages, line windows
as the fallback) and docs (Markdown, reST, HTML, text; CJK-aware sentences), with their references."""
