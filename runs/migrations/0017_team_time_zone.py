from django.db import migrations, models

import runs.models


class Migration(migrations.Migration):
    dependencies = [("runs", "0016_stop_reason_policy_violation")]

    operations = [
        migrations.AddField(
            model_name="team",
            name="time_zone",
            field=models.CharField(
                default="UTC", max_length=64, validators=[runs.models.validate_time_zone]
            ),
        ),
    ]
