"""The documentation stays true to the code it describes: the README stays a first page, every
relative link leads somewhere, the configuration reference lists exactly the keys shim/config.py
defines (with their types, defaults and what the front end does), and the troubleshooting page
lists every check `cdi-shim doctor` has. Read from the sources themselves; no container runs."""
import ast
import glob
import inspect
import os
import re

from shim import config
from shim.node import doctor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
README = os.path.join(ROOT, "README.md")
DOCS = os.path.join(ROOT, "docs")
README_LIMIT = 12 * 1024

FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", re.DOTALL)
LINK = re.compile(r"\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def prose(text):
    """TEXT without fenced blocks and code spans, where brackets are not links."""
    return CODE_SPAN.sub("", FENCE.sub("", text))


def pages():
    return [README] + sorted(glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True))


def slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", lambda m: "_" if m.group() == "_" else "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    seen, out = {}, set()
    for line in FENCE.sub("", read(path)).splitlines():
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def section(text, heading):
    """The lines of TEXT under HEADING (a '## ' line) up to the next heading of that level."""
    start = text.index(heading + "\n") + len(heading) + 1
    end = text.find("\n## ", start)
    return text[start:] if end < 0 else text[start:end]


def table_rows(text):
    """Rows of the markdown tables in TEXT, as lists of cells (header and rule rows left out)."""
    rows = []
    for line in text.splitlines():
        if not line.startswith("|"):
            continue
        cells = [cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]]
        if all(set(cell) <= set("-: ") for cell in cells):
            continue
        rows.append(cells)
    return rows[1:] if rows else rows


# --- the README -------------------------------------------------------------------------------

def test_readme_is_a_first_page():
    size = os.path.getsize(README)
    assert size <= README_LIMIT, f"README.md is {size} bytes, over {README_LIMIT}: move material into docs/"


def test_readme_starts_with_the_two_commands_ci_runs():
    """The README opens with the project's name and one paragraph on what it is; then its first
    code block is the ```sh block .ci/run and scripts/fresh-check.sh take: two commands, the second
    the tests. The tests' duration is said."""
    text = read(README)
    assert text.startswith("# cdi-shim\n\n"), "README.md must open with the project's name"
    intro = text[len("# cdi-shim\n\n"):text.index("```")]
    assert intro.strip() and "\n\n" not in intro.strip() and not intro.lstrip().startswith("#"), \
        "one paragraph on what it is, then the set-up commands"
    start = text.index("```")
    assert text.startswith("```sh\n", start), "the first code block must be the sh block of the two commands"
    block = text[start + len("```sh\n"):text.index("\n```", start + len("```sh"))]
    commands = [line for line in block.splitlines() if line.strip()]
    assert len(commands) == 2, commands
    assert "scripts/demo.sh" in commands[0] and "-m pytest" in commands[1], commands
    assert re.search(r"test suite took about \d+ minutes", text), "say how long the tests take"


# --- links ------------------------------------------------------------------------------------

def test_every_relative_link_resolves():
    broken, checked = [], 0
    for page in pages():
        for target in LINK.findall(prose(read(page))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):   # http:, https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)) if path else page
            checked += 1
            where = f"{os.path.relpath(page, ROOT)}: ({target})"
            if not os.path.exists(resolved):
                broken.append(f"{where}: {os.path.relpath(resolved, ROOT)} does not exist")
            elif anchor and resolved.endswith(".md") and anchor not in anchors(resolved):
                broken.append(f"{where}: no heading with the anchor #{anchor}")
    assert not broken, "\n".join(broken)
    assert checked > 50, checked  # the pages link to one another; a parser that finds none is broken


def test_the_index_links_every_page():
    index = os.path.join(DOCS, "README.md")
    linked = {os.path.normpath(os.path.join(DOCS, target.partition("#")[0]))
              for target in LINK.findall(prose(read(index)))}
    unlinked = [os.path.relpath(page, ROOT) for page in pages()[1:] if page != index and page not in linked]
    assert not unlinked, f"docs/README.md does not link: {unlinked}"


def test_link_parser_sees_links_and_ignores_code():
    text = "see [a](docs/a.md#x) and [b [c]](b.md) `[not](x.md)`\n```\n[nor](y.md)\n```\n"
    assert LINK.findall(prose(text)) == ["docs/a.md#x", "b.md"]
    assert slug('/dev/char links ("Failed to initialize NVML: Unknown Error" after a while)') == \
        "devchar-links-failed-to-initialize-nvml-unknown-error-after-a-while"
    assert slug("`accept-env-unprivileged`: who picks the GPUs") == "accept-env-unprivileged-who-picks-the-gpus"


# --- the configuration reference --------------------------------------------------------------

TYPE_WORDS = {str: "string", tuple: "list of strings", bool: "boolean"}


def documented_keys():
    text = read(os.path.join(DOCS, "configuration.md"))
    rows = table_rows(section(text, "## Keys"))
    keys = {}
    for cells in rows:
        name = cells[0].strip("`")
        assert name not in keys, f"docs/configuration.md lists {name} twice"
        keys[name] = cells
    return keys


def test_configuration_reference_lists_exactly_the_keys_of_shim_config():
    documented = documented_keys()
    defined = {key for key, *_ in config.KEYS}
    assert set(config.Config.DEFAULTS) == {key.replace("-", "_") for key in defined}
    missing, extra = sorted(defined - set(documented)), sorted(set(documented) - defined)
    assert not missing, f"keys missing from docs/configuration.md: {missing}"
    assert not extra, f"docs/configuration.md lists keys shim/config.py lacks: {extra}"


def test_configuration_reference_says_what_shim_config_says():
    """Type, default and the front end's use of each key, as the one table in shim/config.py has them."""
    documented = documented_keys()
    for key, kind, default, choices, front_end, _meaning in config.KEYS:
        name, type_cell, default_cell, _, front_cell = documented[key]
        expected_type = TYPE_WORDS[kind] + (": " + ", ".join(f"`{c}`" for c in choices) if choices else "")
        assert type_cell == expected_type, (key, type_cell, expected_type)
        assert default_cell == f"`{config.toml_value(default)}`", (key, default_cell)
        assert front_cell.split()[0] == front_end, (key, front_cell, front_end)


def test_configuration_reference_shows_the_file_install_writes():
    text = read(os.path.join(DOCS, "configuration.md"))
    block = text[text.index("```toml\n") + len("```toml\n"):]
    shown = block[:block.index("```")].splitlines()
    written = [line.split("#")[0].rstrip() for line in config.default_config_text().splitlines()
               if line and not line.startswith("#")]
    assert shown == written


# --- doctor's checks --------------------------------------------------------------------------

def check_ids(tree):
    """Every "layer.name" a Check(...) or _ok(...) call in TREE makes, by their literal arguments."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("Check", "_ok") and len(node.args) >= 2:
            layer, name = node.args[:2]
            if all(isinstance(arg, ast.Constant) and isinstance(arg.value, str) for arg in (layer, name)):
                ids.add(f"{layer.value}.{name.value}")
    return ids


def doctor_check_ids():
    ids = set()
    for check in doctor.CHECKS:
        found = check_ids(ast.parse(inspect.getsource(check).lstrip()))
        assert found, f"{check.__module__}.{check.__name__}: no Check(layer, name, ...) with literal names found"
        ids |= found
    for path in glob.glob(os.path.join(os.path.dirname(doctor.__file__), "*.py")):
        ids |= check_ids(ast.parse(read(path)))   # helpers that make a check's line for it
    return ids


def test_troubleshooting_lists_every_doctor_check():
    ids = doctor_check_ids()
    assert len(ids) >= len(doctor.CHECKS), ids
    text = read(os.path.join(DOCS, "troubleshooting.md"))
    listed = {cells[0].strip("`") for cells in table_rows(section(text, "## The checks"))}
    assert not ids - listed, f"doctor checks missing from docs/troubleshooting.md: {sorted(ids - listed)}"
    assert not listed - ids, f"docs/troubleshooting.md lists checks doctor lacks: {sorted(listed - ids)}"
