"""LangChain's agent (``langchain.agents.create_agent``) with idempotent tool calls.

Shows: ``create_agent(model, tools, middleware=[IdempotentTools()], checkpointer=saver)``,
where the middleware hands each tool call to ``IdempotentToolCalls`` (the same wrapper
``idempotent_tool_node(tools)`` puts in a LangGraph ``ToolNode``). The model asks for two tools
in one message; the payment call fails once (a network error) and the run stops. Resuming
re-runs the failed call only: the e-mail is not sent again, and the payment API receives the
same idempotency key on both attempts, so it charges once.

Run:  python examples/react_agent_idempotent.py
      (from any directory; its database and keyring go to
      ./.securesaver-examples/react_agent_idempotent/, removed and recreated on every run)
"""

from _fake_model import example_workspace
from langchain.agents import create_agent
from langchain.agents.middleware import AgentMiddleware
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from langgraph_securesaver import SecureSaver
from langgraph_securesaver.idempotency import IdempotentToolCalls, current_idempotency_key

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


class IdempotentTools(AgentMiddleware):
    """Every tool call of the agent through IdempotentToolCalls (its store: the saver)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = IdempotentToolCalls()

    def wrap_tool_call(self, request, handler):
        return self.calls.wrap(request, handler)

    async def awrap_tool_call(self, request, handler):
        return await self.calls.awrap(request, handler)


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
        agent = create_agent(TwoToolModel(), tools=[send_email, charge_card],
                             middleware=[IdempotentTools()], checkpointer=saver)
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
