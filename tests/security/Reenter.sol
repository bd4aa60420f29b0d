// SPDX-License-Identifier: Apache-2.0
pragma solidity 0.8.37;

/// @notice Test-only attacker for tests/security: a contract account that joins a Veriloco run and,
///         when the contract pays it, calls back into the contract with `reentry` calldata.
contract Reenter {
    address public immutable target;
    bytes public reentry; // calldata replayed from receive(); empty = just accept the payment
    uint256 public received; // payments seen
    bool public reentryOk; // whether the nested call succeeded
    bytes public reentryResult; // its return or revert data

    constructor(address target_) {
        target = target_;
    }

    /// @notice Forward a call (with value) to the target, bubbling a revert up unchanged.
    function exec(bytes calldata data) external payable returns (bytes memory out) {
        bool ok;
        (ok, out) = target.call{value: msg.value}(data);
        if (!ok) {
            assembly ("memory-safe") {
                revert(add(out, 32), mload(out))
            }
        }
    }

    function setReentry(bytes calldata data) external {
        reentry = data;
    }

    receive() external payable {
        received += 1;
        if (reentry.length > 0 && received == 1) {
            (reentryOk, reentryResult) = target.call(reentry);
        }
    }
}
