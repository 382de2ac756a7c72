"""The pages (README, docs/, results/'s READMEs) point at what exists: every relative link reaches
a file, and its #anchor a heading there; every repository path they name in backticks is in the
tree. results/ was laid out anew once (#45) and will move again; a page left behind fails here."""
import glob
import os
import re
import subprocess

from tests.helpers import REPO

# Paths the pages name that a checkout only has after a command has made them.
MADE_LATER = {"data/ptb": "make data downloads PTB there"}
TOP_FOLDERS = ("results", "scripts", "docs", "tests", "utils", "data", "launch", ".ci", "examples")


def pages():
    found = ["README.md", *glob.glob("docs/*.md", root_dir=REPO),
             *glob.glob("results/**/README.md", root_dir=REPO, recursive=True)]
    assert len(found) > 10, found  # the globs found the pages at all
    return sorted(found)


def prose(page):
    """The page's text without its code blocks (their paths are commands' arguments)."""
    with open(os.path.join(REPO, page)) as f:
        return re.sub(r"```.*?```", "", f.read(), flags=re.S)


def heading_anchor(heading):
    """GitHub's anchor of a heading: lower case, punctuation but '-' and '_' dropped, spaces
    to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page):
    """The anchors of the page's headings (a `# comment` in a code block is none)."""
    return {heading_anchor(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", prose(page), re.M)}


def test_heading_anchor_by_hand():
    assert heading_anchor("oneDNN on every x86 CPU") == "onednn-on-every-x86-cpu"
    assert heading_anchor("Horovod's steps, 1-10 (and `tf.distribute`)") == \
        "horovods-steps-1-10-and-tfdistribute"


def test_every_relative_link_reaches_a_file_and_its_heading():
    broken, checked = [], 0
    for page in pages():
        for link in re.findall(r"\]\(([^)\s]+)\)", prose(page)):
            if re.match(r"[a-z]+:", link):
                continue  # https:, mailto:
            target, _, anchor = link.partition("#")
            path = os.path.normpath(os.path.join(REPO, os.path.dirname(page), target)) \
                if target else os.path.join(REPO, page)
            checked += 1
            if not os.path.exists(path):
                broken.append(f"{page}: ({link}) leads to no file")
            elif anchor and path.endswith(".md") and anchor not in anchors(path):
                broken.append(f"{page}: ({link}) names no heading of {target or page}")
    assert checked > 40, checked
    assert not broken, "\n".join(broken)


def test_every_path_in_backticks_exists():
    missing, checked = [], 0
    folders = "|".join(re.escape(f) for f in TOP_FOLDERS)
    for page in pages():
        for path in re.findall(rf"`((?:{folders})/[^`\s]*)`", prose(page)):
            path = path.split(":")[0].rstrip("/")  # file:line, test::name, folder/
            if re.search(r"[*<>{}\[\]]|\.\.\.|…", path):
                continue  # a pattern or a placeholder, not a path
            checked += 1
            if path not in MADE_LATER and not os.path.exists(os.path.join(REPO, path)):
                missing.append(f"{page}: `{path}`")
    assert checked > 150, checked
    assert not missing, "named but not in the tree:\n" + "\n".join(missing)


# What only tf-keras calls or sets: on the default Keras 3 a copier following such a line would
# call a minimize(tape=) that does not exist, or switch to tf-keras unknowingly.
KERAS2_ONLY = re.compile(r"minimize\(.*tape=|TF_USE_LEGACY_KERAS=1")
# A line about tf-keras says so, on that line or one of the two before it.
ABOUT_TF_KERAS = re.compile(r"tf-keras|Keras 2|PTB_KERAS=2|not KERAS3|has no `minimize")


def test_no_line_shows_a_tf_keras_only_call_as_the_default():
    stale, checked = [], 0
    files = subprocess.run(["git", "ls-files", "*.py", "*.md", "*.txt", "*.sh", "Makefile",
                            "launch/*"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    this = os.path.relpath(__file__, REPO)  # it names the patterns
    for name in (f for f in files if not f.startswith("results/") and f != this):
        with open(os.path.join(REPO, name)) as f:
            lines = f.read().splitlines()
        checked += 1
        for i, line in enumerate(lines):
            if KERAS2_ONLY.search(line) and not any(ABOUT_TF_KERAS.search(near)
                                                     for near in lines[max(0, i - 2):i + 1]):
                stale.append(f"{name}:{i + 1}: {line.strip()}")
        # and no sentence, comments joined, says the code selects tf-keras by itself
        text = " ".join(line.strip().lstrip("#").strip() for line in lines)
        stale += [f"{name}: ...{m.group(0)}..." for m in
                  re.finditer(r"(?:code|it) sets TF_USE_LEGACY_KERAS=1 \S+ so that[^.;]*", text)]
    assert checked > 80, checked
    assert not stale, "tf-keras-only lines not marked as such:\n" + "\n".join(stale)


def test_results_holds_what_runs_wrote_and_no_code():
    """Scripts live where code does (scripts/probes/ for the probes whose logs are in results/),
    so that results/ is never imported from, nor drawn above the code it measured."""
    files = subprocess.run(["git", "ls-files", "results"], cwd=REPO, capture_output=True,
                           text=True, check=True).stdout.split()
    assert len(files) > 100, len(files)
    code = [f for f in files if f.endswith((".py", ".sh"))]
    assert not code, f"code under results/ (move it to scripts/probes/): {code}"


def test_the_pages_count_the_horovod_patches_there_are():
    """README's count of the CPU build's patches and docs/gpu.md's range of them follow the
    folder (docs/gpu.md once said 01-24 with 25 there)."""
    cpu = sorted(glob.glob("scripts/patches/horovod-0.28.1/*.patch", root_dir=REPO))
    assert len(cpu) > 20 and os.path.basename(cpu[-1]).startswith(f"{len(cpu):02d}-"), cpu
    assert f"built with {len(cpu)} small [patches]" in prose("README.md")
    assert f"(`scripts/patches/horovod-0.28.1/`, 01-{len(cpu):02d})" in prose("docs/gpu.md")


# A page named with a section in quotes (README "The Horovod steps", docs/network.md's
# "Communication options"), or with an #anchor (docs/testing.md#ci), outside a Markdown link.
SECTION_REFERENCE = re.compile(r"\b((?:docs/)?[\w-]+\.md|README)(?:'s)? (?:section )?\"([^\"]+)\"")
ANCHOR_REFERENCE = re.compile(r"(?<![\w/.-])((?:docs/)?[\w-]+\.md)#([\w-]+)")


def named_page(name, where):
    """The file a reference in the file `where` names: README is the front page; a bare
    page.md is beside `where`, else in docs/."""
    if name == "README":
        return "README.md"
    for candidate in (os.path.join(os.path.dirname(where), name), name,
                      os.path.join("docs", name)):
        if os.path.isfile(os.path.join(REPO, candidate)):
            return os.path.normpath(candidate)
    return None


def headings(page):
    with open(os.path.join(REPO, page)) as f:
        return [m.group(1).strip() for m in re.finditer(r"^#+\s+(.*)$",
                                                        re.sub(r"```.*?```", "", f.read(),
                                                               flags=re.S), re.M)]


def test_every_section_named_in_code_and_pages_is_a_heading_there():
    """A section named in words (the heading, or its first words: README "Adapt it") or by its
    anchor, in any file of the tree but the run logs under results/: a section renamed or moved
    to another page fails here (README "Communication" was docs/network.md's for a while)."""
    files = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True,
                           check=True).stdout.split()
    stale, checked = [], 0
    this = os.path.relpath(__file__, REPO)  # its docstrings name sections as examples
    for name in (f for f in files if not f.startswith("results/") and f != this):
        try:
            with open(os.path.join(REPO, name)) as f:
                text = " ".join(f.read().split())  # a reference broken over two lines, joined
        except (UnicodeDecodeError, IsADirectoryError):
            continue  # a binary file
        for m in SECTION_REFERENCE.finditer(text):
            page, title = named_page(m.group(1), name), m.group(2)
            checked += 1
            if page is None:
                stale.append(f"{name}: {m.group(0)} names no page")
            elif not any(h == title or h.startswith(title + " ") for h in headings(page)):
                stale.append(f"{name}: {m.group(0)}: {page} has no such heading")
        for m in ANCHOR_REFERENCE.finditer(text):
            page = named_page(m.group(1), name)
            checked += 1
            if page is None or m.group(2) not in anchors(page):
                stale.append(f"{name}: {m.group(0)}: no such page or heading")
    assert checked > 8, checked
    assert not stale, "sections named but not there:\n" + "\n".join(stale)


def test_the_scripts_help_names_no_path_outside_a_clone():
    """What --help prints (a script's docstring) is copied as it is: a path of the machine it was
    written on (lm_ptb.py showed `--data_path ../shared/data/ptb`) fails for everyone else."""
    import ast
    scripts = sorted(glob.glob("*.py", root_dir=REPO) + glob.glob("scripts/*.py", root_dir=REPO)
                     + glob.glob("launch/*.py", root_dir=REPO))
    outside = []
    for script in scripts:
        with open(os.path.join(REPO, script)) as f:
            doc = ast.get_docstring(ast.parse(f.read())) or ""
        outside += [f"{script}: {m.group(0)}" for m in
                    re.finditer(r"(?<![\w.])(?:\.\./|/work/|/home/|/root/)\S*", doc)]
    assert len(scripts) > 15, scripts
    assert not outside, outside


def test_readme_says_how_to_use_the_venv_before_its_first_python_command():
    """Setup installs into .venv; the system's python has no TensorFlow. A newcomer typing
    README's first `python ...` line must have read how to get .venv's before it."""
    with open(os.path.join(REPO, "README.md")) as f:
        text = f.read()
    first = re.search(r"^```sh\n(?:(?!```).*\n)*?.*\bpython ", text, re.M)
    assert first, "README shows no python command"
    before = text[:first.start()]
    assert ". .venv/bin/activate" in before and ".venv/bin/python" in before, before[-600:]
