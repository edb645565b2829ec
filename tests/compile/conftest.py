from tests.aihub_emulator.fixtures import aihub_emulator  # noqa: F401
