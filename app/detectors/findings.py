"""The value types of the detectors: a finding's category and where it is."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Category(StrEnum):
    """The kinds of content a company's memory policy decides about."""

    SECRETS = "secrets"
    PAYMENT_CARDS = "payment_cards"
    BANK_ACCOUNTS = "bank_accounts"
    NATIONAL_IDS = "national_ids"
    EMAIL_ADDRESSES = "email_addresses"
    PHONE_NUMBERS = "phone_numbers"
    INSTRUCTIONS = "instructions"


@dataclass(frozen=True, slots=True)
class Finding:
    """One detected value: its category, a short kind (`iban`, `password`, `aws-access-key`,
    `us-ssn`, ...), and where it is in the text (`start`/`end` offsets; an instruction spans the
    whole text). Never holds the value itself beyond the offsets."""

    category: Category
    kind: str
    start: int
    end: int
