"""The asyncio control plane: the gRPC servicers (`api`) and their server
(`server`), the job and agent state it keeps (`controller` and its mixins),
straggler detection (`detector`) and the pure decision of when to replan
(`coordinator`)."""
