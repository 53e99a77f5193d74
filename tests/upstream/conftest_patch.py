# --- appended by langgraph-securesaver's upstream harness (tests/upstream/run_langgraph_suite.py) ---
# Redefines the two checkpointer fixtures (a later definition in a conftest wins) so their params
# come from LG_SYNC_CKPTS / LG_ASYNC_CKPTS (comma-separated names from SS_SYNC_CKPTS /
# SS_ASYNC_CKPTS in conftest_checkpointer.py). An empty list skips that kind of test.
from tests.conftest_checkpointer import SS_ASYNC_CKPTS, SS_SYNC_CKPTS


def _ss_names(env: str) -> list:
    raw = os.environ.get(env, "")  # noqa: F821
    return [n for n in (p.strip() for p in raw.split(",")) if n]


@pytest.fixture(scope="function", params=_ss_names("LG_SYNC_CKPTS"))  # noqa: F821
def sync_checkpointer(request):
    with SS_SYNC_CKPTS[request.param]() as checkpointer:
        yield checkpointer


@pytest.fixture(scope="function", params=_ss_names("LG_ASYNC_CKPTS"))  # noqa: F821
async def async_checkpointer(request):
    factory = SS_ASYNC_CKPTS[request.param]
    cm = factory()
    if hasattr(cm, "__aenter__"):
        async with cm as checkpointer:
            yield checkpointer
    else:
        with cm as checkpointer:
            yield checkpointer



if os.environ.get("SS_TENANCY") == "scope":  # noqa: F821
    @pytest.fixture(autouse=True)  # noqa: F821
    def _ss_tenant_scope():
        """Every test runs inside tenant_scope("t") (the saver has no default tenant)."""
        from langgraph_securesaver import tenant_scope

        with tenant_scope("t"):
            yield


# langchain_core's chat models add the installed `langchain` version to metadata["lc_versions"]
# (BaseLanguageModel.model_post_init). The test extra installs langchain (examples/react_agent_*),
# langgraph's own test environment does not, and its message-stream tests compare lc_versions
# exactly ({"langchain-core": ...}): hide langchain from that lookup, for raw and wrapped alike.
import langchain_core.language_models.base as _ss_lc_base  # noqa: E402

_ss_lc_base._get_langchain_version = lambda: None
