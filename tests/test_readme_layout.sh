#!/usr/bin/env bash
# The README's "Layout" block names the tree as it is: every folder at the start of a
# line exists, and every file name in it (`sdpa_ref.c`, `gemm*.c`, `cmd_*.c`, ...)
# matches a file under the folder of its line. A file that moves or a folder that is
# split makes this fail, so the block cannot go stale unnoticed.
set -u
: "${ATTN_SOURCE_DIR:?}"
fail=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fail=1; }
cd "$ATTN_SOURCE_DIR" || exit 1

block=$(awk '/^## Layout$/ { f = 1; next } f && /^```/ { if (in_b) exit; in_b = 1; next } f && in_b' README.md)
[ -n "$block" ] || { bad "README.md has no fenced block under '## Layout'"; exit 1; }

dir="" folders=0 files=0
while IFS= read -r line; do
    first=${line%% *}
    if [ -n "$first" ]; then # a line that starts a folder (or names a file at the top)
        dir=$first
        folders=$((folders + 1))
        if [ -e "$dir" ]; then ok "the Layout's '$dir' exists"; else bad "the Layout names '$dir', which does not exist"; fi
        rest=${line#"$first"}
    else
        rest=$line
    fi
    [ -d "$dir" ] || continue
    # File names in the description: words ending in .c, .h, .py, .md, .sh.
    for name in $(grep -oE '[A-Za-z0-9_*-]+(\.\[ch\]|\.[a-z]+)' <<<"$rest" | grep -E '\.(c|h|py|md|sh|\[ch\])$'); do
        files=$((files + 1))
        pat=${name/.\[ch\]/.[ch]}
        if [ -n "$(find "$dir" -name "$pat" -print -quit)" ]; then ok "'$name' is under $dir"; else
            bad "the Layout's $dir line names '$name', and no file under $dir matches it"; fi
    done
done <<<"$block"

[ "$folders" -ge 10 ] && [ "$files" -ge 20 ] && ok "the block names $folders folders and $files files" \
    || bad "the block names only $folders folders and $files files: has it been cut?"
[ $fail -eq 0 ] && echo "test_readme_layout: all passed"
exit $fail
