# Sourced by ./dev and packaging/setup-venv.sh: does a virtual environment run from where it is?

# script_python FILE: the interpreter a script pip wrote names: `#!/path/python`, or pip's `#!/bin/sh` form for a
# path too long for a #! line (`'''exec' /path/python "$0" "$@"`) or with a space (the path in double quotes)
script_python() {
    local first="" second=""
    { IFS= read -r first; IFS= read -r second; } < "$1" || true
    if [ "$first" = "#!/bin/sh" ]; then
        second=${second#*exec\' }
        if [ "${second:0:1}" = '"' ]; then
            second=${second#\"}
            printf '%s\n' "${second%%\"*}"
        else
            printf '%s\n' "${second%% *}"
        fi
    else
        first=${first#\#!}
        printf '%s\n' "${first%% *}"
    fi
}

# venv_runs_here VENV SCRIPT: VENV's Python runs, and VENV/bin/SCRIPT names an interpreter in VENV/bin itself
# (compared by real path: a checkout reached through a symlink is the same place). A checkout moved elsewhere
# keeps scripts that name the old place and exit 127; a removed Python leaves bin/python dangling.
venv_runs_here() {
    local v=$1 py
    "$v/bin/python" -c '' >/dev/null 2>&1 || return 1
    [ -f "$v/bin/$2" ] || return 0
    py=$(script_python "$v/bin/$2")
    [ -x "$py" ] || return 1
    [ "$(cd "$(dirname "$py")" 2>/dev/null && pwd -P)" = "$(cd "$v/bin" && pwd -P)" ]
}

# refuse_non_venv VENV: stop, saying so, when VENV is a folder with something in it but no pyvenv.cfg (a home folder,
# a project given by mistake): the setup scripts remove and make again the folder they are given, and must never
# remove one that is not a virtual environment
refuse_non_venv() {
    if [ -d "$1" ] && [ ! -f "$1/pyvenv.cfg" ] && [ -n "$(ls -A "$1" 2>/dev/null)" ]; then
        echo "error: $1 is a folder that is not a Python virtual environment (no pyvenv.cfg): it is left as it is." >&2
        echo "  what to do: give the path of a new folder (or of an existing virtual environment) instead." >&2
        exit 2
    fi
}
