@echo off
rem HexStudio for Windows 11: starts the studio inside WSL2; WSLg shows its window.
rem Needs: packaging/install-workstation.sh run once inside WSL (it creates ~/.local/bin/hexstudio-launch).
rem Copy this file to your desktop, or make a shortcut to it (Properties: Run: Minimized hides this console).
rem Another distribution than the default one: set HEXSTUDIO_DISTRO=Ubuntu-22.04 (or edit the line below).
setlocal
set "HEXSTUDIO_DISTRO_ARGS="
if defined HEXSTUDIO_DISTRO set "HEXSTUDIO_DISTRO_ARGS=-d %HEXSTUDIO_DISTRO%"
where wsl.exe >nul 2>nul || (echo HexStudio needs WSL2: run "wsl --install" in an administrator PowerShell, then reboot. & pause & exit /b 1)
rem The studio's output goes to ~/.config/hexstudio/logs/launch.log inside WSL (its own log, studio.log, beside it).
wsl.exe %HEXSTUDIO_DISTRO_ARGS% --cd ~ --exec /bin/sh -c "HEXSTUDIO_LOG_OUTPUT=1 exec ~/.local/bin/hexstudio-launch"
if errorlevel 1 (
    echo HexStudio ended with an error ^(code %errorlevel%^).
    echo Its output is in ~/.config/hexstudio/logs/launch.log and studio.log inside WSL.
    echo If it says hexstudio-launch: not found, run packaging/install-workstation.sh inside WSL first.
    pause
)
endlocal
