"""Usage metering per company and day (turns, contexts, consolidations, model calls and the
tokens the provider reported, with an estimated cost) and the monthly model budget per company."""
