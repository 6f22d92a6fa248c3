from __future__ import annotations

from django.apps import AppConfig


class PoliciesConfig(AppConfig):
    name = "policies"
    verbose_name = "Policies"

    def ready(self) -> None:
        from planning.signals import plans_await_approval, steps_await_approval
        from policies.services import plans_waiting_decide, steps_waiting_decide

        # The planning services say, in their transaction, that an item waits; the policies decide it there.
        steps_await_approval.connect(steps_waiting_decide, dispatch_uid="policies.steps_waiting_decide")
        plans_await_approval.connect(plans_waiting_decide, dispatch_uid="policies.plans_waiting_decide")
