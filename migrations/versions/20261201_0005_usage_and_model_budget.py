"""Usage metering and the model budget per company.

`usage_daily_counts`: per company, UTC day and counter (turns saved, contexts served,
consolidations by outcome) how many times it happened; rows are added to by upserts.

`usage_daily_model_calls`: per company, UTC day, call kind and model, the answered model calls
and the prompt and completion tokens the provider reported for them.

`company_model_budgets`: a company's monthly token budget (NULL: unlimited) and what the worker
does once it is spent (`offline` or `defer`); no row is no budget. Who changed it is in the
audit trail.

`model_budget_crossings`: the 80 % and 100 % thresholds a company crossed in a month, so that
the alert counter is incremented once per company and month.

None of them names a user. Downgrade drops all four (the counts are lost, every company is back
to no budget).

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 19:00:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COUNTERS = (
    "'turns_saved', 'contexts_served', 'consolidations_updated', 'consolidations_noop', "
    "'consolidations_failed', 'consolidations_deferred', 'consolidations_offline'"
)
CALL_KINDS = "'gate', 'operations', 'rewrite', 'condensation'"


def _now(name: str) -> sa.Column[object]:
    return sa.Column(
        name, sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False
    )


def upgrade() -> None:
    op.create_table(
        "usage_daily_counts",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("counter", sa.String(length=32), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(f"counter IN ({COUNTERS})", name=op.f("ck_usage_daily_counts_counter")),
        sa.CheckConstraint("count >= 0", name=op.f("ck_usage_daily_counts_count_not_negative")),
        sa.PrimaryKeyConstraint("company_id", "day", "counter", name=op.f("pk_usage_daily_counts")),
    )
    op.create_table(
        "usage_daily_model_calls",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("day", sa.Date(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("calls", sa.BigInteger(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("completion_tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint(f"kind IN ({CALL_KINDS})", name=op.f("ck_usage_daily_model_calls_kind")),
        sa.CheckConstraint(
            "calls >= 0 AND prompt_tokens >= 0 AND completion_tokens >= 0",
            name=op.f("ck_usage_daily_model_calls_not_negative"),
        ),
        sa.PrimaryKeyConstraint(
            "company_id", "day", "kind", "model", name=op.f("pk_usage_daily_model_calls")
        ),
    )
    op.create_table(
        "company_model_budgets",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("monthly_tokens", sa.BigInteger(), nullable=True),
        sa.Column("when_spent", sa.String(length=16), nullable=False),
        _now("updated_at"),
        sa.CheckConstraint(
            "when_spent IN ('offline', 'defer')", name=op.f("ck_company_model_budgets_when_spent")
        ),
        sa.CheckConstraint(
            "monthly_tokens IS NULL OR monthly_tokens >= 0",
            name=op.f("ck_company_model_budgets_monthly_tokens"),
        ),
        sa.PrimaryKeyConstraint("company_id", name=op.f("pk_company_model_budgets")),
    )
    op.create_table(
        "model_budget_crossings",
        sa.Column("company_id", sa.String(length=128), nullable=False),
        sa.Column("period", sa.Date(), nullable=False),
        sa.Column("threshold_percent", sa.SmallInteger(), nullable=False),
        _now("crossed_at"),
        sa.CheckConstraint(
            "threshold_percent IN (80, 100)",
            name=op.f("ck_model_budget_crossings_threshold_percent"),
        ),
        sa.PrimaryKeyConstraint(
            "company_id", "period", "threshold_percent", name=op.f("pk_model_budget_crossings")
        ),
    )


def downgrade() -> None:
    op.drop_table("model_budget_crossings")
    op.drop_table("company_model_budgets")
    op.drop_table("usage_daily_model_calls")
    op.drop_table("usage_daily_counts")
