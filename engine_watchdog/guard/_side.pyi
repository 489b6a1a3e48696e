# The compiled module's interface (guard/_side.c); guard/side.py says what it does.
from collections.abc import Callable
from typing import Any

class Side:
    _feed: Callable[[bytes], Any]
    _ready: list[bytes]
    _client: Any
    failure: BaseException | None
    def data_received(self, data: bytes) -> None: ...
