"""Launch command templates: values never enter the command text.

A project admin writes a bash template with placeholders ({{run_key}}, ...). The values
(a run key comes from a training job's ingest token, the least trusted credential) are
never spliced into the text, quoted or not: each placeholder becomes a reference to an
environment variable that the launched job receives (GitHub Actions' guidance against
script injection). {{run_key}} outside quotes becomes "${LIFEBOAT_RUN_KEY}", inside
double quotes ${LIFEBOAT_RUN_KEY}: bash expands a variable once and never reads its value
as code, so `$(...)`, backticks, quotes, `;` or newlines in a value stay characters.

That holds only where bash expands the reference as a plain word. check() refuses, with
the position, the reason and the way to write it, a placeholder:
- inside single quotes or $'...' (it would not be expanded at all);
- inside `...`, $(...), <(...), ${...}, $((...)), ((...)), $[...] or [[ ... ]]
  (arithmetic contexts evaluate a value's `a[$(cmd)]` as code; write the command
  substitution with "$LIFEBOAT_..." itself);
- in a comment or an #SBATCH line (sbatch reads those lines without a shell) or a
  here-document;
- after a `$` or a backslash, or inside an array subscript `a[...]=`;
- in a word that a command runs as code: anything after `eval`, `ssh`, `watch` or
  `parallel`, and the code argument of `bash -c`, `sh -c`, `python -c`, `perl -e`,
  `node -e`, `su -c`, `flock -c` and the like (pass the value through the environment
  instead: `bash -c 'train --run "$LIFEBOAT_RUN_KEY"'`).
The last list cannot be complete: a program that runs its argument as code is the
admin's choice, and docs/restore.md says so.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

PLACEHOLDER = re.compile(r"\{\{\s*([a-z_]+)\s*\}\}")
NAMES = (
    "checkpoint_path",
    "checkpoint_dir",
    "checkpoint_id",
    "step",
    "run_key",
    "new_run_key",
    "resume_id",
    "world_size",
)

# Programs that join their arguments into a command line for a shell.
_RUNS_ALL_ARGS = frozenset({"eval", "ssh", "watch", "parallel", "tmux"})
# Programs whose option (c or e) makes the next argument code.
_CODE_OPTION = {
    **dict.fromkeys(("sh", "bash", "dash", "zsh", "ksh", "mksh", "fish", "csh", "tcsh"), "c"),
    **dict.fromkeys(("su", "runuser", "flock", "script"), "c"),
    **dict.fromkeys(("perl", "ruby", "node", "nodejs", "Rscript"), "e"),
}
_PYTHON = re.compile(r"^(python|pypy)[0-9.]*$")
# Programs that take the code option after other arguments (su USER -c CMD).
_OPTION_ANYWHERE = frozenset({"su", "runuser", "flock", "script"})
# Options that take the next word as their argument (bash -o pipefail, python -W x).
_TAKES_ARGUMENT = frozenset({"o", "O", "W", "X"})
_RESERVED = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{", "time"})
_SUBSCRIPT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\[[^\]]*$")

HOW = (
    'Put the placeholder where bash reads a plain word (bare, or inside "double quotes"), '
    'or use the variable the job receives yourself, e.g. "$LIFEBOAT_RUN_KEY".'
)


class TemplateRefused(ValueError):
    """The template puts a placeholder where no value can be made safe; the message
    names it, its line and column, why, and how to write it instead."""


def env_name(name: str) -> str:
    """The environment variable that carries {{name}} to the job."""
    return f"LIFEBOAT_{name.upper()}"


@dataclass(frozen=True)
class _Spot:
    name: str
    start: int
    end: int
    quoted: bool  # inside top-level double quotes


def _where(template: str, index: int) -> str:
    line = template.count("\n", 0, index) + 1
    column = index - (template.rfind("\n", 0, index) + 1) + 1
    return f"line {line}, column {column}"


def _bare(word: str) -> str:
    return word.replace('"', "").replace("'", "").replace("\\", "")


def _code_word_reason(words: list[str]) -> str | None:
    """Why the next word of this simple command is run as code, or None. `words` are the
    command's words before the one that holds the placeholder."""
    plain = [_bare(w) for w in words]
    for index, word in enumerate(plain):
        base = os.path.basename(word)
        if base in _RUNS_ALL_ARGS:
            return f"{base} runs its arguments as a shell command"
        letter = "c" if _PYTHON.match(base) else _CODE_OPTION.get(base)
        if letter is None:
            continue
        rest = plain[index + 1 :]
        skip = False
        for position, option in enumerate(rest):
            if skip:
                skip = False
                continue
            if option[:1] not in "-+" or option in ("-", "--"):
                if base in _OPTION_ANYWHERE:
                    continue
                break  # the script or program: its own options are not the interpreter's
            if option[1:] in _TAKES_ARGUMENT:
                skip = True
                continue
            if (option.startswith("--") and option[2:] in ("command", "eval")) or (
                not option.startswith("--") and letter in option[1:]
            ):
                after = rest[position + 1 :]
                # The first word after the option that is not an option is the code;
                # words after it are plain arguments ($1, sys.argv[1]).
                if all(w[:1] in "-+" for w in after) and not (base in _OPTION_ANYWHERE and after):
                    return f"{base} {option} runs that argument as code"
                break
    return None


class _Scanner:
    """One pass over the template, keeping a stack of the shell contexts it is in."""

    def __init__(self, template: str) -> None:
        self.text = template
        self.stack: list[list] = []  # [kind, depth]
        self.words: list[str] = []  # the current simple command's words (top level)
        self.word = ""
        self.heredocs: list[tuple[str, bool]] = []
        self.spots: list[_Spot] = []

    def refuse(self, index: int, name: str, why: str, how: str = HOW) -> None:
        raise TemplateRefused(
            f"{{{{{name}}}}} at {_where(self.text, index)} is {why}. {how}".strip()
        )

    def end_word(self) -> None:
        if self.word:
            if not self.words and self.word in _RESERVED:
                self.word = ""
                return
            self.words.append(self.word)
            self.word = ""

    def end_command(self) -> None:
        self.end_word()
        self.words = []

    def placeholder(self, match: re.Match) -> None:
        name, index = match.group(1), match.start()
        kinds = [k for k, _ in self.stack]
        if kinds == ["sq"] or kinds == ["ansi"]:
            self.refuse(index, name, "inside single quotes, where nothing is expanded")
        if kinds and kinds != ["dq"]:
            self.refuse(index, name, _CONTEXT_WHY[kinds[-1] if kinds[-1] != "dq" else kinds[0]])
        before = self.text[:index]
        slashes = len(before) - len(before.rstrip("\\"))
        if slashes % 2:
            self.refuse(index, name, "after a backslash")
        if before.endswith("$"):
            self.refuse(index, name, "right after a `$`")
        if not kinds and _SUBSCRIPT.match(self.word):
            self.refuse(index, name, "inside an array subscript, which bash evaluates as code")
        reason = _code_word_reason(self.words)
        if reason:
            self.refuse(
                index,
                name,
                f"in a word that is run as code ({reason})",
                "Read the value from the environment inside that code instead, e.g. "
                "bash -c 'train --run \"$LIFEBOAT_RUN_KEY\"'.",
            )
        self.spots.append(_Spot(name, match.start(), match.end(), kinds == ["dq"]))
        self.word += "{}"

    def read_heredocs(self, i: int) -> int:
        """i is just after a newline; skip the bodies of the pending here-documents."""
        text = self.text
        for delimiter, strip_tabs in self.heredocs:
            while i < len(text):
                end = text.find("\n", i)
                end = len(text) if end < 0 else end
                line = text[i:end]
                match = PLACEHOLDER.search(line)
                if (line.lstrip("\t") if strip_tabs else line) == delimiter:
                    i = end + 1
                    break
                if match:
                    self.refuse(
                        i + match.start(),
                        match.group(1),
                        "inside a here-document",
                        'Write the line with "$LIFEBOAT_…" in an unquoted here-document, or '
                        "put the value on the command line.",
                    )
                i = end + 1
        self.heredocs = []
        return i

    def heredoc_start(self, i: int) -> int:
        """i is at `<<`; note the delimiter, return the index after it."""
        text, j = self.text, i + 2
        strip_tabs = text.startswith("-", j)
        j += strip_tabs
        while j < len(text) and text[j] in " \t":
            j += 1
        start = j
        while j < len(text) and text[j] not in " \t\n;&|<>()":
            j += 1
        self.heredocs.append((_bare(text[start:j]), strip_tabs))
        self.word += text[i:j]
        return j

    def scan(self) -> list[_Spot]:
        text, n, i = self.text, len(self.text), 0
        while i < n:
            match = PLACEHOLDER.match(text, i)
            if match:
                self.placeholder(match)
                i = match.end()
                continue
            c = text[i]
            top = self.stack[-1][0] if self.stack else None
            if top == "comment":
                if c == "\n":
                    self.stack.pop()
                    continue
                i += 1
                continue
            if top == "sq":
                if c == "'":
                    self.stack.pop()
                self.word += c
                i += 1
                continue
            if top == "ansi":
                if c == "\\":
                    self.word += text[i : i + 2]
                    i += 2
                    continue
                if c == "'":
                    self.stack.pop()
                self.word += c
                i += 1
                continue
            i = self.step(i, c, top)
        return self.spots

    def step(self, i: int, c: str, top: str | None) -> int:
        text = self.text
        if c == "\\":
            if text.startswith("\\\n", i):  # a line continuation joins the words
                return i + 2
            self.word += text[i : i + 2]
            return i + 2
        if top == "dq":
            if c == '"':
                self.stack.pop()
                self.word += c
                return i + 1
            # _add returns None on purpose: the `or` adds c and then gives i + 1.
            return self.expansion(i, c) or (self._add(c) or i + 1)  # type: ignore[func-returns-value]
        if c == "'":
            self.stack.append(["sq", 0])
        elif text.startswith("$'", i):
            self.stack.append(["ansi", 0])
            self.word += "$'"
            return i + 2
        elif c == '"':
            self.stack.append(["dq", 0])
        elif top == "bt" and c == "`":
            self.stack.pop()
        elif (after := self.expansion(i, c)) is not None:
            return after
        elif top == "param" and c in "{}":
            self.stack[-1][1] += 1 if c == "{" else -1
            if self.stack[-1][1] == 0:
                self.stack.pop()
        elif top in ("cmdsub", "arith") and c in "()":
            self.stack[-1][1] += 1 if c == "(" else -1
            if self.stack[-1][1] == 0:
                self.stack.pop()
        elif top == "bracket" and c == "]":
            self.stack.pop()
        elif top == "dbracket" and text.startswith("]]", i):
            self.stack.pop()
            self.word += "]]"
            return i + 2
        elif c == "#" and not self.word and top in (None, "cmdsub", "bt"):
            self.stack.append(["comment", 0])
            return i + 1
        elif top is None:
            return self.top_level(i, c)
        self.word += c
        return i + 1

    def _add(self, c: str) -> None:
        self.word += c

    def expansion(self, i: int, c: str) -> int | None:
        """Open $((, $(, ${, $[, <( or >( or `; the index after the opener, or None."""
        text = self.text
        for opener, kind, depth in (
            ("$((", "arith", 2),
            ("$(", "cmdsub", 1),
            ("${", "param", 1),
            ("$[", "bracket", 1),
            ("`", "bt", 0),
        ):
            if text.startswith(opener, i):
                self.stack.append([kind, depth])
                self.word += opener
                return i + len(opener)
        if (
            c in "<>"
            and text.startswith("(", i + 1)
            and (self.stack[-1:] or [[None]])[0][0] != "dq"
        ):
            self.stack.append(["cmdsub", 1])
            self.word += text[i : i + 2]
            return i + 2
        return None

    def top_level(self, i: int, c: str) -> int:
        text = self.text
        if c in " \t":
            self.end_word()
            return i + 1
        if c == "\n":
            self.end_command()
            return self.read_heredocs(i + 1) if self.heredocs else i + 1
        if text.startswith("<<", i) and not text.startswith("<<<", i):
            return self.heredoc_start(i)
        if not self.word and text.startswith("[[", i):
            self.stack.append(["dbracket", 0])
            self.word += "[["
            return i + 2
        if not self.word and text.startswith("((", i):
            self.stack.append(["arith", 2])
            self.word += "(("
            return i + 2
        if c == "&" and (self.word[-1:] in ("<", ">") or text.startswith("&>", i)):
            self.word += c  # a redirection (2>&1, &>file), not the end of a command
            return i + 1
        if c in ";&|()":
            self.end_command()
            return i + 1
        self.word += c
        return i + 1


_CONTEXT_WHY = {
    "sq": "inside single quotes, where nothing is expanded",
    "ansi": "inside $'...', where nothing is expanded",
    "bt": 'inside `...`: write $(...) with "$LIFEBOAT_…" in it yourself',
    "cmdsub": 'inside $(...): write the variable there yourself, e.g. $(dirname "$LIFEBOAT_'
    'CHECKPOINT_PATH")',
    "param": "inside ${...}",
    "arith": "inside an arithmetic expression, which evaluates a value's a[$(cmd)] as code",
    "bracket": "inside an arithmetic expression, which evaluates a value's a[$(cmd)] as code",
    "dbracket": "inside [[ ... ]], whose -eq/-lt evaluate a value as arithmetic (code): use "
    '[ "$LIFEBOAT_STEP" -eq ... ]',
    "comment": "in a comment or an #SBATCH line, which sbatch reads without a shell",
}


def check(template: str) -> list[_Spot]:
    """Refuse unknown placeholders and placeholders no value can be made safe in
    (TemplateRefused); return where each placeholder is."""
    unknown = sorted({m.group(1) for m in PLACEHOLDER.finditer(template)} - set(NAMES))
    if unknown:
        raise TemplateRefused(
            f"unknown placeholder {{{{{unknown[0]}}}}} in the command; known: "
            + ", ".join(f"{{{{{n}}}}}" for n in NAMES)
        )
    scanner = _Scanner(template)
    spots = scanner.scan()
    seen = {spot.start for spot in spots}
    for match in PLACEHOLDER.finditer(template):
        if match.start() not in seen:  # swallowed by a `\` or a `${` just before it
            scanner.refuse(match.start(), match.group(1), "not where bash reads a word")
    open_kinds = [k for k, _ in scanner.stack if k != "comment"]
    if open_kinds:
        raise TemplateRefused(
            f"the command leaves {_OPEN[open_kinds[-1]]} open: bash would refuse it"
        )
    return spots


_OPEN = {
    "sq": "a single quote",
    "ansi": "a $'...' string",
    "dq": "a double quote",
    "bt": "a backtick",
    "cmdsub": "a $( or <(",
    "param": "a ${",
    "arith": "an arithmetic (( ",
    "bracket": "a $[",
    "dbracket": "a [[",
}


def render(template: str) -> str:
    """The command as it runs: every {{name}} replaced by a reference to the variable
    env_name(name) ("${VAR}" bare, ${VAR} inside double quotes). Raises TemplateRefused."""
    out, last = [], 0
    for spot in check(template):
        out.append(template[last : spot.start])
        ref = "${" + env_name(spot.name) + "}"
        out.append(ref if spot.quoted else f'"{ref}"')
        last = spot.end
    out.append(template[last:])
    return "".join(out)


def uses(template: str, name: str) -> bool:
    """Whether the template has a {{name}} placeholder."""
    return any(found.group(1) == name for found in PLACEHOLDER.finditer(template))


def variables(values: dict) -> dict[str, str]:
    """The environment variables that carry the placeholders' values."""
    return {env_name(name): str(values[name]) for name in NAMES}
