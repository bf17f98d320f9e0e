"""The NRI tests' shared fixture: the plugin's hook server at a private socket, its log kept."""
import re

import pytest

from shim.nri.hookserver import HookServer


@pytest.fixture
def server(tmp_path):
    """(the HookServer serving at tmp_path/hook/h.sock, the lines it logged: each answer's time
    taken left out)."""
    logged = []
    served = HookServer(str(tmp_path / "hook" / "h.sock"),
                        lambda level, message: logged.append(re.sub(r" \([0-9.]+ ms, planned\)$", "", message))).start()
    yield served, logged
    served.close()
