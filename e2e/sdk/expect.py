"""What the SDK scripts share: `expect(error_name, call)` runs `call` and
returns the exception it raised, checking its class name (each SDK's typed
errors: AuthenticationError, RateLimitError, ...); anything else fails."""


def expect(error_name, call):
    try:
        call()
    except Exception as err:  # noqa: BLE001 - the type is what is checked
        assert type(err).__name__ == error_name, repr(err)
        return err
    raise AssertionError(f"expected {error_name}")
