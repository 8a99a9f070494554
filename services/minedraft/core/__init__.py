"""What every service shares and none needs torch for: requests, sampling parameters,
validation, errors, the tokenizer and the proto codec. The batch manager imports only this
(plus the generated stubs), so its image and start-up carry no torch."""
