"""A prebuilt ReAct agent whose tool list is wrapped for idempotency.

Shows: ``create_react_agent(model, tools=idempotent_tool_node(tools), checkpointer=saver)``.
The model asks for two tools in one message; the payment call fails once (a network error)
and the run stops. Resuming re-runs the tool step, but the e-mail that was already sent is
replayed from the idempotency store instead of being sent again, and the payment API receives
the same idempotency key on both attempts. (``langchain.agents.create_agent`` takes the same
kind of tool list: pass it the wrapped ToolNode.)

Run:  python examples/react_agent_idempotent.py
      (from any directory; its database and keyring go to
      ./.securesaver-examples/react_agent_idempotent/, removed and recreated on every run)
"""

import warnings

from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.cli.demo import example_workspace
from langgraph_securesaver.idempotency import current_idempotency_key, idempotent_tool_node

SENT: list[str] = []            # what the outside world saw
CHARGES: list[str] = []         # idempotency keys the payment API received
FAIL_NEXT_CHARGE = [True]


@tool
def send_email(to: str, body: str) -> str:
    """Send an e-mail."""
    SENT.append(to)
    return f"sent to {to}"


@tool
def charge_card(amount: int) -> str:
    """Charge the customer's card."""
    CHARGES.append(current_idempotency_key())   # pass it to your payment provider
    if FAIL_NEXT_CHARGE:
        FAIL_NEXT_CHARGE.pop()
        raise ConnectionError("payment API timed out")
    return f"charged {amount}"


class TwoToolModel(BaseChatModel):
    """Scripted: first asks for both tools in one message, then says it is done."""

    @property
    def _llm_type(self) -> str:
        return "two-tool-script"

    def bind_tools(self, tools, **kwargs):
        return self

    def _generate(self, messages, stop=None, run_manager=None, **kwargs) -> ChatResult:
        if isinstance(messages[-1], ToolMessage):
            reply = AIMessage(content="done: e-mailed the receipt and charged the card")
        else:
            reply = AIMessage(content="", tool_calls=[
                {"name": "send_email", "args": {"to": "li.na@example.com", "body": "receipt"},
                 "id": "call_email"},
                {"name": "charge_card", "args": {"amount": 42}, "id": "call_charge"}])
        return ChatResult(generations=[ChatGeneration(message=reply)])


def main() -> None:
    workspace = example_workspace("react_agent_idempotent")   # a fresh dir and keyring.json
    print(workspace.describe())
    db = workspace.path / "agent.db"
    config = {"configurable": {"thread_id": "order-42", "tenant_id": "acme"}}
    with SecureSaver.from_url(f"sqlite:///{db}", keyring=workspace.keyring) as saver:
        with warnings.catch_warnings():      # create_react_agent is deprecated upstream
            warnings.simplefilter("ignore")
            # version="v1": both tool calls run as one task, so a failure re-runs the sibling
            agent = create_react_agent(TwoToolModel(),
                                       tools=idempotent_tool_node([send_email, charge_card]),
                                       checkpointer=saver, version="v1")
        try:
            agent.invoke({"messages": [("user", "charge me and mail the receipt")]}, config,
                         durability="sync")
        except ConnectionError as exc:
            print("first attempt failed:", exc)
        out = agent.invoke(None, config, durability="sync")      # resume from the checkpoint
        print("agent:", out["messages"][-1].content)
        print("e-mails sent:", len(SENT))
        print("charge attempts:", len(CHARGES), "same key:", len(set(CHARGES)) == 1)


if __name__ == "__main__":
    main()
