"""A batch script read with a real bash parser (tree-sitter's bash grammar): its ``#SBATCH`` directives, and its
top-level statements with their words as bash would see them, each word's value known only where no expansion,
glob or substitution could change it. Pure: text in, data out.

What the grammar gets wrong is mended or refused here, never guessed: a line of several assignments followed by
a command on the next line is read by it as one command (``A=1 B=2`` / ``echo x``), and is split back into two;
text it cannot parse is a ``ScriptError`` naming the line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from typing import Any

from launch.backends.slurm import sbatch_text

_VARIABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_GLOB = re.compile(r"(?<!\\)[*?\[]")
_ESCAPE_IN_DOUBLE_QUOTES = re.compile(r"\\([\\\"$`\n])")
# What sbatch reads its options from, up to the first command (sbatch's own code knows both words).
MAGIC_WORDS = ("#SBATCH", "#SLURM")


class ScriptError(ValueError):
    """Text the parser cannot read: the line, and why."""


@dataclass(frozen=True)
class Part:
    """A piece of a word: literal text, a plain variable (``$X``, ``${X}``, ``${X:-}``: ``text`` is its name), or
    something bash computes when it runs (a substitution, arithmetic, another expansion, a glob, a tilde: ``text``
    is as written)."""

    text: str
    variable: bool = False
    unknown: bool = False


@dataclass(frozen=True)
class Word:
    """One word of a command as written (``text``), and its pieces as bash sees them."""

    text: str
    parts: tuple[Part, ...]
    split: bool = False  # an unquoted expansion: bash splits its value into words

    @property
    def literal(self) -> str | None:
        """Its value where it expands nothing."""
        if any(part.variable or part.unknown for part in self.parts):
            return None
        return "".join(part.text for part in self.parts)

    def template(self) -> str | None:
        """The value with each variable as ``${NAME}`` (a profile's env and ``--expand-args`` form), or None where
        it is not that simple, or where its literal text holds a ``$`` that form would read as a variable."""
        if any(part.unknown or (not part.variable and "$" in part.text) for part in self.parts):
            return None
        return "".join("${" + part.text + "}" if part.variable else part.text for part in self.parts)


@dataclass(frozen=True)
class Statement:
    """A top-level statement: ``kind`` is ``command`` (a simple command, maybe with ``VAR=value`` before it),
    ``assign`` (assignments alone), ``declare`` (export, declare, local...: ``words`` holds its flags), or the
    grammar's name of a compound construct (``if_statement``, ``list``, ``pipeline``, ``function_definition``...)."""

    line: int
    end_line: int
    text: str  # as written, without a trailing ``&``
    kind: str
    words: tuple[Word, ...] = ()
    assignments: tuple[tuple[str, Word | None], ...] = ()  # declare: a name alone has None
    redirects: tuple[str, ...] = ()
    background: bool = False
    items: tuple[Statement, ...] = ()  # a list or pipeline: its commands, in order
    operators: tuple[str, ...] = ()  # a list or pipeline: the &&, || or | between them

    @property
    def name(self) -> str | None:
        """The command's literal first word."""
        return self.words[0].literal if self.kind == "command" and self.words else None

    def shown(self) -> str:
        return self.text + (" &" if self.background else "")


@dataclass(frozen=True)
class Directive:
    line: int
    text: str
    options: tuple[tuple[str, str | None], ...]


@dataclass(frozen=True)
class Script:
    directives: tuple[Directive, ...]
    statements: tuple[Statement, ...]
    late_directives: tuple[int, ...] = ()  # lines of #SBATCH after the first command: sbatch ignores them


@cache
def _parser() -> Any:
    import tree_sitter
    import tree_sitter_bash

    return tree_sitter.Parser(tree_sitter.Language(tree_sitter_bash.language()))


def read(text: str) -> Script:
    """The script's directives (sbatch reads them up to the first command) and its statements."""
    if "\r\n" in text:
        raise ScriptError("DOS line breaks (\\r\\n): sbatch refuses the script too; convert it with dos2unix")
    statements = parse(text)
    first = statements[0].line if statements else len(text.splitlines()) + 1
    directives, late = [], []
    for number, line in enumerate(text.splitlines(), 1):
        magic = next((word for word in MAGIC_WORDS if line.startswith(word)), None)
        if magic is None:
            continue
        if number > first:
            late.append(number)
            continue
        try:
            words = sbatch_text.directive_words(line[len(magic):])
        except ValueError as error:
            raise ScriptError(f"line {number}: {error} (sbatch refuses it too)") from None
        if any(word in ("hetjob", "packjob", ":") for word in words):
            raise ScriptError(f"line {number}: a heterogeneous job (its components after {words[0]}...): launch runs "
                              "one allocation")
        try:
            directives.append(Directive(number, line, tuple(sbatch_text.options(words))))
        except ValueError as error:
            raise ScriptError(f"line {number}: {error} (sbatch refuses it too)") from None
    return Script(tuple(directives), statements, tuple(late))


def parse(text: str, *, first_line: int = 1) -> tuple[Statement, ...]:
    """The top-level statements of shell ``text`` (a script, or a ``bash -c`` string starting at ``first_line``)."""
    source = text.encode()
    root = _parser().parse(source).root_node
    if root.has_error:
        bad = _first_error(root)
        row = (bad.start_point[0] if bad is not None else 0) + first_line
        raise ScriptError(f"line {row}: bash's grammar cannot read it (an unclosed quote, bracket or construct?)")
    out: list[Statement] = []
    children = root.children
    for index, node in enumerate(children):
        if not node.is_named or node.type == "comment":
            continue
        following = children[index + 1] if index + 1 < len(children) else None
        background = following is not None and following.type == "&"
        out += _statements(node, source, first_line, background)
    return tuple(out)


def _first_error(node: Any) -> Any:
    if node.type == "ERROR" or node.is_missing:
        return node
    for child in node.children:
        if child.has_error or child.is_missing:
            found = _first_error(child)
            if found is not None:
                return found
    return None


def _text(node: Any, source: bytes) -> str:
    return source[node.start_byte:node.end_byte].decode()


def _statements(node: Any, source: bytes, first_line: int, background: bool) -> list[Statement]:
    line, end = node.start_point[0] + first_line, node.end_point[0] + first_line
    text = _text(node, source)
    redirects: tuple[str, ...] = ()
    body = node
    if node.type == "redirected_statement":
        inner = node.child_by_field_name("body")
        if inner is not None and inner.type == "command":
            body = inner
            redirects = tuple(_text(child, source) for child in node.named_children if child.type.endswith("redirect"))
    if body.type == "command":
        assignments = [child for child in body.named_children if child.type == "variable_assignment"]
        name = body.child_by_field_name("name")
        between = source[assignments[-1].end_byte:name.start_byte] if assignments and name is not None else b""
        if re.search(rb"(?<!\\)\n", between):
            # the grammar's misreading: `A=1 B=2` on one line and a command on the next, read as one command
            split = Statement(line, assignments[-1].end_point[0] + first_line,
                              source[assignments[0].start_byte:assignments[-1].end_byte].decode(), "assign",
                              assignments=tuple(_assignment(child, source) for child in assignments))
            rest = _command(body, source, first_line, skip=len(assignments), background=background,
                            redirects=redirects, start=name, outer=node)
            return [split, rest]
        return [_command(body, source, first_line, skip=0, background=background, redirects=redirects, outer=node)]
    if node.type in ("variable_assignment", "variable_assignments"):
        found = [node] if node.type == "variable_assignment" else \
            [child for child in node.named_children if child.type == "variable_assignment"]
        return [Statement(line, end, text, "assign", assignments=tuple(_assignment(child, source) for child in found),
                          background=background)]
    if node.type == "declaration_command":
        keyword = _text(node.children[0], source)
        flags: list[Word] = [Word(keyword, (Part(keyword),))]
        pairs: list[tuple[str, Word | None]] = []
        for child in node.named_children:
            if child.type == "variable_assignment":
                pairs.append(_assignment(child, source))
            elif child.type == "variable_name":
                pairs.append((_text(child, source), None))
            else:
                flags.append(_word(child, source))
        return [Statement(line, end, text, "declare", words=tuple(flags), assignments=tuple(pairs),
                          background=background)]
    if node.type in ("list", "pipeline"):
        items: list[Statement] = []
        operators: list[str] = []
        for child in node.children:
            if child.is_named:
                inner = _statements(child, source, first_line, False)
                if child.type == node.type:  # a && b && c: the grammar nests them
                    items += inner[0].items
                    operators += inner[0].operators
                else:
                    items += inner
            elif child.type in ("&&", "||", "|", "|&"):
                operators.append(child.type)
        return [Statement(line, end, text, node.type, background=background, items=tuple(items),
                          operators=tuple(operators))]
    return [Statement(line, end, text, node.type, background=background)]


def _command(node: Any, source: bytes, first_line: int, *, skip: int, background: bool,
             redirects: tuple[str, ...], outer: Any, start: Any = None) -> Statement:
    """A simple command; its text (from ``start``, else its own start) runs to the end of ``outer``: the
    redirections and here-documents of a redirected command are part of it."""
    named = node.named_children
    assignments = tuple(_assignment(child, source) for child in named[skip:] if child.type == "variable_assignment")
    words: list[Word] = []
    extra_redirects = []
    for child in named[skip:]:
        if child.type == "variable_assignment":
            continue
        if child.type.endswith("_redirect"):
            extra_redirects.append(_text(child, source))
        elif child.type == "command_name":
            words.append(_word(child.named_children[0] if child.named_children else child, source))
        else:
            words.append(_word(child, source))
    begin = start if start is not None else node
    text = source[begin.start_byte:outer.end_byte].decode()
    return Statement(begin.start_point[0] + first_line, outer.end_point[0] + first_line, text, "command",
                     words=tuple(words), assignments=assignments, redirects=(*extra_redirects, *redirects),
                     background=background)


def _assignment(node: Any, source: bytes) -> tuple[str, Word | None]:
    name = node.child_by_field_name("name")
    value = node.child_by_field_name("value")
    title = _text(name, source) if name is not None else _text(node, source).split("=", 1)[0]
    if any(child.type == "+=" for child in node.children):  # appends to a value launch does not know
        shown = _text(node, source)
        return title, Word(shown, (Part(shown, unknown=True),))
    if value is None:
        return title, Word("", (Part(""),))
    return title, _word(value, source)


def _unknown(node: Any, source: bytes) -> tuple[Part, ...]:
    return (Part(_text(node, source), unknown=True),)


def _word(node: Any, source: bytes) -> Word:
    unquoted = ("simple_expansion", "expansion", "command_substitution")
    split = node.type in unquoted or (node.type == "concatenation"
                                      and any(child.type in unquoted for child in node.children))
    return Word(_text(node, source), _parts(node, source), split)


def _parts(node: Any, source: bytes) -> tuple[Part, ...]:
    kind, text = node.type, _text(node, source)
    if kind in ("simple_expansion", "expansion"):
        return _expansion(kind, text)
    if kind in ("word", "number"):
        if _GLOB.search(text) or text.startswith("~"):
            return _unknown(node, source)
        return (Part(re.sub(r"\\(.)", r"\1", text.replace("\\\n", ""), flags=re.S)),)
    if kind == "raw_string":
        return (Part(text[1:-1]),)
    if kind == "string":
        parts: list[Part] = []
        position = node.start_byte + 1
        for child in node.named_children:
            if child.start_byte > position:  # text the grammar leaves between named pieces (spaces, newlines)
                parts.append(Part(_double_quoted(source[position:child.start_byte].decode())))
            if child.type == "string_content":
                parts.append(Part(_double_quoted(_text(child, source))))
            else:  # the grammar may start a piece with the text before its `$` or backtick
                piece = _text(child, source)
                start = min((at for at in (piece.find("$"), piece.find("`")) if at >= 0), default=0)
                if start:
                    parts.append(Part(_double_quoted(piece[:start])))
                rest = piece[start:]
                parts += _expansion(child.type, rest) if child.type in ("simple_expansion", "expansion") else \
                    (Part(rest, unknown=True),)
            position = child.end_byte
        if node.end_byte - 1 > position:
            parts.append(Part(_double_quoted(source[position:node.end_byte - 1].decode())))
        return tuple(parts) or (Part(""),)
    if kind == "concatenation":
        # text between the named pieces the grammar keeps unnamed (`a=`, `:` ...) is literal
        pieces: list[Part] = []
        position = node.start_byte
        for child in node.children:
            if child.start_byte > position:
                pieces.append(Part(source[position:child.start_byte].decode()))
            pieces += _parts(child, source) if child.is_named else (Part(_text(child, source)),)
            position = child.end_byte
        return tuple(pieces)
    return _unknown(node, source)  # command/process substitution, arithmetic, ANSI-C strings, arrays...


def _expansion(kind: str, text: str) -> tuple[Part, ...]:
    if kind == "simple_expansion":
        name = text[1:]
        return (Part(name, variable=True),) if _VARIABLE.match(name) else (Part(text, unknown=True),)
    found = re.fullmatch(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(:-)?\}", text)
    return (Part(found[1], variable=True),) if found else (Part(text, unknown=True),)


def _double_quoted(text: str) -> str:
    return _ESCAPE_IN_DOUBLE_QUOTES.sub(lambda found: "" if found[1] == "\n" else found[1], text)
