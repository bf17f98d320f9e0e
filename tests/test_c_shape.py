"""The shape of the product's C (csrc/frontend, csrc/engine, csrc/hooks, csrc/launcher): no circle
between the files of one folder (a file that calls a name another defines depends on it; two
that depend on each other, directly or around a loop, are one concern split badly), and no
function longer than the bound. Read from the sources alone: comments, strings and
preprocessor lines (with their continuation lines) taken out, definitions found at file scope.
And docs/development.md names every file of those folders and the generated headers, and says
how to make them again."""
import os
import re

TOP = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FOLDERS = ("csrc/frontend", "csrc/engine", "csrc/hooks", "csrc/launcher")
MAX_FUNCTION_LINES = 80
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")
KEYWORDS = {"static", "extern", "typedef", "struct", "enum", "union", "const", "inline", "unsigned", "signed"}


def code_of(text):
    """TEXT with comments, string and character literals and preprocessor lines blanked (newlines
    kept, so line numbers hold)."""
    pattern = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|^[ \t]*#(?:\\\n|[^\n])*',
                         re.S | re.M)
    return pattern.sub(lambda match: re.sub(r"[^\n]", " ", match.group()), text)


def file_scope(code):
    """(text, first line, last line, body) of each chunk at file scope: a declaration up to its
    ';', or a definition with its braced body (body True)."""
    chunks, depth, start = [], 0, 0
    for at, char in enumerate(code):
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            head = code[start:code.index("{", start)] if depth == 0 else ""
            if "(" in head and "=" not in head:     # (not a struct, enum or initializer)
                chunks.append((head, code.count("\n", 0, start + len(head) - len(head.lstrip())) + 1,
                               code.count("\n", 0, at) + 1, True))
                start = at + 1
        elif char == ";" and depth == 0:
            chunks.append((code[start:at], 0, 0, False))
            start = at + 1
    return chunks


def defined(code):
    """The names CODE defines for other files (not static): its functions and variables."""
    names = set()
    for text, _, _, body in file_scope(code):
        words = IDENTIFIER.findall(text)
        if not words or words[0] in ("static", "extern", "typedef"):
            continue
        if body:
            names.add(IDENTIFIER.findall(text[:text.index("(")])[-1])
        elif "(" not in text.split("=")[0]:     # a variable, not a prototype
            text = re.sub(r"\{.*\}", "", text, flags=re.S)     # (a struct's members, an initializer)
            text = re.sub(r"^\s*(?:struct|enum|union)\s+\w+", "", text)     # (the tag: a type, no variable)
            names.update(re.findall(r"([A-Za-z_]\w*)\s*(?:=|,|\[|$)", re.sub(r"=[^,]*", "=", text.strip())))
    return names - KEYWORDS - {"main"}     # (each program's own: never called from another file)


def functions(code):
    """(name, first line, lines) of each function CODE defines."""
    return [(IDENTIFIER.findall(text[:text.index("(")])[-1], first, last - first + 1)
            for text, first, last, body in file_scope(code) if body]


def sources(folder, suffixes=(".c",)):
    root = os.path.join(TOP, folder)
    out = {}
    for name in sorted(os.listdir(root)):
        if name.endswith(suffixes):
            with open(os.path.join(root, name)) as stream:
                out[f"{folder}/{name}"] = code_of(stream.read())
    return out


def dependencies(files):
    """file -> {file it calls into: the names it uses there}."""
    owner = {name: path for path, code in files.items() for name in defined(code)}
    graph = {}
    for path, code in files.items():
        used = set(re.findall(r"(?<!\.)(?<!->)\b[A-Za-z_]\w*", code))      # (not a member: x.name, p->name)
        graph[path] = {}
        for name in sorted(used):
            if owner.get(name, path) != path:
                graph[path].setdefault(owner[name], []).append(name)
    return graph


def circles(graph):
    """Each loop of GRAPH once, as the list of its files (depth-first, from every file)."""
    found = set()
    out = []

    def walk(path, trail):
        for target in graph[path]:
            if target in trail:
                loop = trail[trail.index(target):]
                key = frozenset(loop)
                if key not in found:
                    found.add(key)
                    out.append(loop + [target])
            elif len(trail) < len(graph):
                walk(target, trail + [target])

    for path in graph:
        walk(path, [path])
    return out


def test_the_reader_sees_a_circle_and_a_long_function():
    files = {"a.c": code_of('#include "x.h"\nint a(void)\n{\n    return b(); /* c() */\n}\nconst char *v, *w = "t";\n'
                            "struct s {\n    int m[(2)], n;\n};\nstruct s u = {1, 2};\n"),
             "b.c": code_of("static int c(void) { return 0; }\nint b(void)\n{\n    return a() + c();\n}\n"),
             "c.c": code_of("#define CHECK(x) \\\n    do { \\\n        if (a(x)) \\\n"
                            "            return 1; \\\n    } while (0)\n"
                            "int d(void);\nint e(struct s *p)\n{\n    return d() + (int)*w + p->v + p[0].a;\n}\n")}
    assert defined(files["a.c"]) == {"a", "v", "w", "u"} and defined(files["b.c"]) == {"b"}
    graph = dependencies(files)
    assert graph == {"a.c": {"b.c": ["b"]}, "b.c": {"a.c": ["a"]}, "c.c": {"a.c": ["w"]}}
    assert [sorted(loop) for loop in circles(graph)] == [["a.c", "a.c", "b.c"]]
    assert functions(files["a.c"]) == [("a", 2, 4)]
    assert functions(files["c.c"]) == [("e", 7, 4)]     # (a macro's continued lines are no code)


def test_no_circle_between_the_files_of_a_folder():
    for folder in FOLDERS:
        graph = dependencies(sources(folder))
        loops = circles(graph)
        assert not loops, "files that call into each other: " + "; ".join(
            loop[0] + "".join(f" -({', '.join(graph[path][nxt])})-> {nxt}" for path, nxt in zip(loop, loop[1:]))
            for loop in loops)


def test_no_function_over_the_bound():
    over = [f"{path}:{first} {name} ({lines} lines)" for folder in FOLDERS
            for path, code in sources(folder, (".c", ".h")).items() for name, first, lines in functions(code)
            if lines > MAX_FUNCTION_LINES]
    assert not over, f"over {MAX_FUNCTION_LINES} lines, split by concern: " + ", ".join(over)


def test_the_developers_page_names_every_c_file_and_the_generated_headers():
    from shim import native_headers
    with open(os.path.join(TOP, "docs", "development.md")) as stream:
        page = stream.read()
    missing = [f"{folder}/{name}" for folder in FOLDERS
               for name in sorted(os.listdir(os.path.join(TOP, folder)))
               if name.endswith((".c", ".h", ".py")) and f"`{name}`" not in page
               and f"`{name.rsplit('.', 1)[0]}.c`/`.h`" not in page]
    missing += [f"{path} (as generated)" for path in native_headers.HEADERS if f"`{path}`" not in page]
    if "python -m shim.native_headers" not in page:
        missing.append("how to make the generated headers again (python -m shim.native_headers)")
    assert not missing, "docs/development.md does not name: " + ", ".join(missing)
