"""A stored message's token count may be absent: turn-save no longer counts, history loads do.

`chat_messages.tokens` becomes nullable. Turn-save stores NULL; the history read bounds an
uncounted message by its UTF-8 length (a cl100k token is at least one byte) and counts it
exactly only when the bounds alone cannot settle the history budget (`app/conversations/modes.py`).
Rows written before keep their counts, which the read uses as they are.

Downgrade counts nothing: it sets every missing count to the message's UTF-8 length (an upper
bound, so a budget is never exceeded) before the column is NOT NULL again.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01 20:30:00+00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.alter_column("chat_messages", "tokens", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE chat_messages SET tokens = octet_length(content) WHERE tokens IS NULL")
    op.alter_column("chat_messages", "tokens", existing_type=sa.Integer(), nullable=False)
