"""The template language front end (docs/language.md §1-§13):
text --parse--> lark.Tree --build_ast--> ast.Template --compile_template--> ir.Program."""

from qrun.lang.build import build_ast
from qrun.lang.compiler import compile_template
from qrun.lang.front_end import compile_file, compile_source
from qrun.lang.parser import parse

__all__ = ["build_ast", "compile_file", "compile_source", "compile_template", "parse"]
